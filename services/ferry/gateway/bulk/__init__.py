"""Bulk jobs in the gateway: their routes, and the runner that feeds their items as tasks."""
