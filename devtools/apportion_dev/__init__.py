"""apportion's test harness and demo (devtools/README.md): tools for the project and for users
trying it, kept out of the product."""
