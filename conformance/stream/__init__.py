"""One Generate call as the client sees it: the live call, its record, and the tolerant wire decoder."""
