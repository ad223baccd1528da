"""The plugin surface: the interface, the declarations, the registry, probes, the adapter
toolkit, environment conditions, known behaviours."""
