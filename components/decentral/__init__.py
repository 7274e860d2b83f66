"""The ``decentral`` plugin: decentralized training on hivemind (Atom)."""
