"""servediag webhook: Alertmanager notifications in, diagnosed alerts out."""
