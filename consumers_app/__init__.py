"""The consumer engine as a Django app: embedded broker, clients, strategies, lab controller."""
