"""`calispec eval`: accuracy and speed of each decoding mode on tasks shipped in the repo.

tasks (the data and how it is prompted) · scorers (pass@1 in a sandboxed subprocess, numeric
answers) · rejections (coverage curve, pure) · runner (the requests, gRPC) · report (table,
JSON, PNG).
"""
