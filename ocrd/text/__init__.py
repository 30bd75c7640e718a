"""The text model every stage shares: DeepSeek-OCR-2's grounding output parsed into blocks
with boxes (`grounding`), text lines put in reading order (`lines`), and clean Markdown
(`markdown`)."""
