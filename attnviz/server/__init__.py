"""What this server may load and how it runs: model specs and allow-lists (`specs`), environment
flags (`env`), settings (`settings`), the inference gate of the hosted demo (`gate`) and the web
app's files inside the package (`app_files`)."""
