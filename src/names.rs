//! Enums whose variants each have one user-facing name, written once: the
//! name list, `name()`, `Display` and `FromStr` all come from the same table,
//! and the CLI's `ValueEnum` (in cli/) from `ALL` and `name()`. A variant
//! without a name does not compile.

/// `named_enum! { #[derive(..)] pub enum T ("a thing,") { V => "v", ... } }`
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $t:ident ($what:literal) {
            $($(#[$vm:meta])* $v:ident => $name:literal),* $(,)?
        }
    ) => {
        $(#[$m])*
        $vis enum $t {
            $($(#[$vm])* $v),*
        }

        impl $t {
            /// Every variant, in declaration order.
            pub(crate) const ALL: &'static [$t] = &[$($t::$v),*];

            /// The name users type and read.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $($t::$v => $name),*
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t>::ALL
                    .iter()
                    .copied()
                    .find(|v| v.name() == s)
                    .ok_or_else(|| {
                        let names: Vec<&str> = <$t>::ALL.iter().map(|v| v.name()).collect();
                        format!("{s:?}: expected {} one of {}", $what, names.join(", "))
                    })
            }
        }
    };
}

/// `eprintln!` that never panics: a closed stderr (`2>&1 | head`) is not a
/// reason to turn a rank's exit code into a panic's.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // One write of the whole line: processes sharing the stream (ranks
        // under bind, their holders) never cut into each other's lines.
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

/// `eprint!` of a whole text, never panicking.
#[macro_export]
macro_rules! say_text {
    ($text:expr) => {{
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(AsRef::<[u8]>::as_ref(&$text));
    }};
}
