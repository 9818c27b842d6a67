"""Tools above the services: the CLI, the local stack launcher, model pull, load tests and
benchmarks, evaluation, and deployment (Ray, Kubernetes). Services never import this package."""

import os

# gRPC's C core printed a failed TLS handshake at INFO on stderr ("I1206 ... Handshake failed ...") above a
# command's own one-line error. It reads this when grpc is first imported (here, before any tool imports it);
# a value the user set wins. The services `calispec up` starts inherit it: their logs keep gRPC's errors.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
