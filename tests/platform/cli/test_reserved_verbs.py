"""Every core verb of the `strata` parser is reserved: a plugin's command can never shadow one.

(The CLI table in docs/cli.md showed `migrate`, `check`, `secrets` and `artifacts` missing from
``registry.RESERVED_COMMANDS``: a plugin naming one would have been loaded, and argparse would then refuse the
duplicate verb, costing the whole CLI instead of the plugin.)
"""

from components.runtime.contract import registry
from strata.cli.main import build_parser
from strata.docs_tables import _subcommands


def test_every_core_verb_is_reserved():
    plugin_verbs = set(registry.commands())
    core = {name for name, _, _ in _subcommands(build_parser())} - plugin_verbs
    assert core and not core - registry.RESERVED_COMMANDS, sorted(core - registry.RESERVED_COMMANDS)
