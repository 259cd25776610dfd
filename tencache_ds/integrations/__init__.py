"""Adapters to training frameworks. Only this package imports them."""
