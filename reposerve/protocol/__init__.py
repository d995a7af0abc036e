"""The KServe V2 wire format: requests and responses <-> Tensors, and the JSON documents.

Pure functions over bytes and config Structs: no Starlette, no processes, no backends.
"""
