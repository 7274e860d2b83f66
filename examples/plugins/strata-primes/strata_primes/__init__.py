"""strata-primes: an example Strata plugin (see README.md)."""
