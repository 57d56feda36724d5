"""What any program that talks to servers needs, and nothing about LLM serving: the metric
source, HTTP with deadlines and limits, listeners, redaction, atomic writes, TLS, the user-error
types."""
