"""TokenSpeed command line."""
