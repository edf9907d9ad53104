"""The engine loop: scheduler plans in, executor work out, events back."""
