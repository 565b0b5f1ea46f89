"""Sharing an extended model: the portable export and its numerical check (``export``, ``export_check``), model
cards (``cards``), pushing to the Hub (``hub``) and the self-contained remote-code module (``remote_code``)."""
