"""Programs that show how to use Apprentice from the outside (docs/gateway.md)."""
