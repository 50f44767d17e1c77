//! poimen
