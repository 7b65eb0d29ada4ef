"""What produces model inputs:

  synthetic  the synthetic Qwen2/Qwen3 generator: graphs, weights, encodings, tokenizer (in memory)
  generate   the same files streamed tensor by tensor to disk (any size; the `inputs` step)
  export     the user's exported inputs: present, pinned, usable
"""
