"""Built-in chat templates (Jinja2), for the vocabularies that carry none."""
