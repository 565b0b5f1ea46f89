"""Attention-level methods: each module registers one rope_type that changes how scores or outputs are formed."""
