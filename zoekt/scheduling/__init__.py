"""Task creation and state upkeep between a plan and a searchable namespace."""
