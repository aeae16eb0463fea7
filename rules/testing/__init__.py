"""Testing rules: finite differences and rule testers (ChainRulesTestUtils for JAX)."""
