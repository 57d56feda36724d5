"""The metric domain: the families engines expose, the engine registry, the PromQL builders
over them and the signal vocabulary."""
