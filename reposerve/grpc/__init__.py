"""The gRPC front: Triton's GRPCInferenceService over ``reposerve.service``."""
