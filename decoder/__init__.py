"""Reference Medusa decoder: a Llama-family model with KV cache and tree attention, Medusa heads,
acceptance schemes and acceptance recording."""
