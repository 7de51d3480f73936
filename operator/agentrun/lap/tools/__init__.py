"""Tools: argument validation and the HTTP tool runner."""
