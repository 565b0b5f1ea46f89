"""Small helpers every part uses: progress output (``progress``), dropped warnings (``quiet``), spelling
suggestions (``did_you_mean``)."""
