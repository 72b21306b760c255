"""The view catalog, the engines that decide by querying it, and replay."""
