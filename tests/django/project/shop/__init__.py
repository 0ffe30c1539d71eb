"""The shop: orders, and the tasks that follow them up."""
