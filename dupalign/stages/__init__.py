"""The three stages of a page, typed input → typed output: sketch, index, align."""
