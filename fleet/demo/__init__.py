"""Things for running llmgw without real hardware: a tiny model real llama.cpp can serve."""
