// Placeholder: implemented by work in progress.
