"""The serving core shared by the four services: errors, limits, request types, sampling,
the model runner and its KV-cached sessions, timing, protobuf conversions and gRPC plumbing.

It depends on the contract (`calispec.v1`) only; services build on it, tools sit above both.
"""
