"""A PostgreSQL database backend that starts the embedded server on first connection.

Settings name it as ENGINE when DATABASE_URL is unset. It behaves exactly like Django's
PostgreSQL backend once connected; the only difference is where the connection goes: the unix
socket of the server whose data lives in ``EMBEDDED_DATA_DIR`` (started if it is not running,
shared by every process that points at the same directory).
"""
