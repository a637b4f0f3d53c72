//! The one integration-test harness (see design.md, Style 7).
