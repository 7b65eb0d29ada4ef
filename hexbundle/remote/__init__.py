"""A REAPI (Remote Execution API v2) cache client: each build step's outputs shared between
machines, keyed by the step's Action (its Command, exact options and platform, and the Merkle
tree of its input files).

  reapi      the REAPI v2 messages and gRPC method paths this client uses (the wire format)
  action     a step's Command, input root and Action, and so its cache key
  cas        the gRPC client: ActionCache, ContentAddressableStorage, ByteStream, Capabilities
  cache      around a step: look up, fetch the outputs (checked) or run and upload; degrade
  buildgrid  a local BuildGrid server for the tests and the benchmark
"""
