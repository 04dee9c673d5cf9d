"""The cost report: its figures, its rendering and its command line."""
