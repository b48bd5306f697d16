"""`chatrun report`: what became of a bot's conversations, as one self-contained HTML file
(docs/report.md). `read` takes the rows from a store, `figures` counts them, `render` draws."""
