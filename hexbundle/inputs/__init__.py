"""What produces model inputs: the synthetic Qwen2 generator, and the user's exports."""
