"""HTTP routes: validate → convert → await the backend client → shape the response."""
