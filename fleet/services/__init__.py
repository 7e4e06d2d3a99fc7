"""Every domain operation, as plain functions. Callers never re-implement them."""
