"""`calispec bench`: a load tester that drives a coordinator through the client SDK.

arrivals (when requests start) · prompts (what they ask) · runner (the asyncio loop, gRPC) ·
metrics (records → figures, no gRPC) · report (table, JSON, PNG, no gRPC).
"""
