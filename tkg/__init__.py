"""tkg: embedded temporal knowledge-graph memory for AI agents."""
