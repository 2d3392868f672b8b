"""An app of the host's own, with a code workflow (docs/how-to/embed-in-django.md, "Code
workflows of your own")."""
