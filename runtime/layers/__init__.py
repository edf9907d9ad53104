"""Model building blocks: every numeric op goes through ``tokenspeed.kernels``."""
