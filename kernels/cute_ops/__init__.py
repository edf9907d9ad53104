"""CuTe DSL kernels for Hopper (SM90), registered as SPECIALIZED candidates.

Importing this package needs ``nvidia-cutlass-dsl`` (the ``hopper`` extra); the registry
imports it only when a capability check found that package and an SM90 GPU.
"""
