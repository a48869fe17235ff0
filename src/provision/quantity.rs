//! Kubernetes resource quantities for storage sizes: parsing a claim's request to bytes (rounded
//! up, as `Quantity.Value()`), and printing bytes the way `resource.NewQuantity(n, BinarySI)`
//! does, so PV capacities read exactly like upstream's.

/// Why a quantity string is not a usable size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    /// Not of the form `<number><suffix>` (e.g. `10Gi`, `500M`, `1.5Ti`, `1e9`).
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Syntax,
    /// A negative size.
    #[error("size must not be negative")]
    Negative,
    /// Larger than 2^63-1 bytes.
    #[error("size is too large")]
    TooLarge,
}

/// Bytes of a quantity string, rounded up to a whole byte.
pub(crate) fn parse_quantity(s: &str) -> Result<i64, QuantityError> {
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(QuantityError::Syntax);
    }
    let (binary_shift, decimal_exp) = parse_suffix(suffix)?;

    // mantissa · 2^binary_shift · 10^(decimal_exp − fraction digits), rounded up.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative);
    }
    // A u128 holds 38 digits. Longer mantissas (`5` and 40 zeros, `e-40`) keep 37 and stand
    // for the rest with one digit, 1 when any dropped digit is not 0, so rounding up stays exact.
    let dropped = digits.len().saturating_sub(38);
    let kept = if dropped == 0 {
        digits.to_owned()
    } else {
        let sticky = if digits[37..].bytes().any(|b| b != b'0') {
            '1'
        } else {
            '0'
        };
        format!("{}{sticky}", &digits[..37])
    };
    let mantissa: u128 = kept.parse().map_err(|_| QuantityError::Syntax)?;
    let scaled = mantissa
        .checked_mul(1u128 << binary_shift)
        .ok_or(QuantityError::TooLarge)?;
    let shift = |n: usize| i64::try_from(n).map_err(|_| QuantityError::Syntax);
    // Saturating: an exponent near i64::MIN is far below one byte either way.
    let exp = decimal_exp
        .saturating_sub(shift(frac_part.len())?)
        .saturating_add(shift(dropped)?);
    let value = if exp >= 0 {
        let factor = u32::try_from(exp)
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
            .ok_or(QuantityError::TooLarge)?;
        scaled.checked_mul(factor).ok_or(QuantityError::TooLarge)?
    } else {
        match u32::try_from(exp.unsigned_abs())
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
        {
            Some(divisor) => scaled.div_ceil(divisor),
            // Smaller than one byte, but not zero: rounds up to one.
            None => 1,
        }
    };
    i64::try_from(value).map_err(|_| QuantityError::TooLarge)
}

/// `(binary shift, decimal exponent)` of a suffix.
fn parse_suffix(suffix: &str) -> Result<(u32, i64), QuantityError> {
    Ok(match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or(QuantityError::Syntax)?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Syntax);
            }
            (0, exp.parse().map_err(|_| QuantityError::TooLarge)?)
        }
    })
}

/// `resource.NewQuantity(bytes, BinarySI).String()`: the largest binary suffix that divides the
/// value exactly (`5Gi`, `1536Ki`), no suffix otherwise (`1500`); values below 1024 print in
/// decimal SI, as upstream (`1000` is `1k`).
pub(crate) fn bytes_to_quantity(bytes: i64) -> String {
    if bytes.unsigned_abs() < 1024 {
        return if bytes != 0 && bytes % 1000 == 0 {
            format!("{}k", bytes / 1000)
        } else {
            bytes.to_string()
        };
    }
    let mut amount = bytes;
    let mut exponent = 0;
    while amount % 1024 == 0 && exponent < 6 {
        amount /= 1024;
        exponent += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exponent];
    format!("{amount}{suffix}")
}

#[cfg(test)]
#[path = "quantity_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "quantity_tests.rs"]
mod tests;
