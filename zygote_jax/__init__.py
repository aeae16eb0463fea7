"""zygote_jax: Zygote.jl's user API on JAX."""
