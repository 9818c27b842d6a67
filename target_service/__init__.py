"""The target model service. Its processes spin OpenMP threads briefly (set before torch loads)."""

from calispec_core.openmp import limit_idle_spinning

limit_idle_spinning()
