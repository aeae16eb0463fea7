"""rules: ChainRules.jl's rule system for JAX."""
