"""The ``straggler`` plugin: data-parallel training that shrugs off stragglers (SAS placement, SMS, Stanza)."""
