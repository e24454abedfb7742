"""Games for measuring credit assignment over turns (not shipped as demos)."""
