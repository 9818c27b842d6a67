"""Tools above the services: the CLI, the local stack launcher, model pull, load tests and
benchmarks, evaluation, and deployment (Ray, Kubernetes). Services never import this package."""
