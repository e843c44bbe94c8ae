"""Index/component templates and retention policy bodies (JSON), read by kibana.load_template."""
