//! Decimal text at the edge, integer minor units inside, and the rounding rules of SPEC §8.
//!
//! Parsing never rounds and never truncates: a string with more decimal places than the
//! asset's scale is refused (`0.000100001` BTC is not "about 0.0001"). The arithmetic of
//! notional, fee and fee reserve runs in 128-bit integers and is checked against the
//! 64-bit range and the asset's maximum before anything is written.

use crate::asset::{Asset, Market};

/// Longest decimal string accepted, characters (longer text is refused before parsing).
/// 30 digits times 10^8 stay below the 128-bit limit (about 1.7 × 10^38), so no accepted
/// text can overflow while it is parsed.
pub const MAX_DECIMAL_CHARS: usize = 30;
/// The fee, in basis points of a fill's notional, charged to each side.
pub const FEE_BPS: i64 = 10;
/// Basis points in one whole.
pub const BPS_PER_WHOLE: i64 = 10_000;

/// Why a decimal string or an amount was refused. The text is meant for a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    /// Not of the form `digits` or `digits.digits` (no sign, exponent, blank, leading zero,
    /// leading or trailing point).
    #[error(
        "{what} must be a decimal string of the form 123 or 123.45 (digits 0-9, no sign, exponent, blank, leading zero, or a point without digits on both sides)"
    )]
    Syntax {
        /// What was parsed, e.g. `"quantity"`.
        what: &'static str,
    },
    /// Longer than [`MAX_DECIMAL_CHARS`].
    #[error("{what} is longer than {MAX_DECIMAL_CHARS} characters")]
    TooLong {
        /// What was parsed.
        what: &'static str,
    },
    /// More decimal places than the asset allows; never rounded or truncated.
    #[error("{what} has {places} decimal places; {asset} allows at most {scale}")]
    TooPrecise {
        /// What was parsed.
        what: &'static str,
        /// The asset whose scale applies.
        asset: Asset,
        /// Places in the text.
        places: usize,
        /// The asset's scale.
        scale: u32,
    },
    /// Zero (an amount, price or quantity must be positive).
    #[error("{what} must be greater than 0")]
    NotPositive {
        /// What was parsed.
        what: &'static str,
    },
    /// Above the largest accepted value.
    #[error("{what} exceeds the maximum of {maximum}")]
    OverMaximum {
        /// What was parsed.
        what: &'static str,
        /// The maximum, as decimal text with its asset.
        maximum: String,
    },
    /// Not a multiple of the market's step.
    #[error("{what} must be a multiple of {step}")]
    OffStep {
        /// What was parsed.
        what: &'static str,
        /// The step, as decimal text with its asset.
        step: String,
    },
    /// A derived amount (notional, freeze) past the 64-bit range of minor units.
    #[error("{what} would exceed the 64-bit range of {asset} units")]
    OutOfRange {
        /// What was computed, e.g. `"order notional"`.
        what: &'static str,
        /// Its asset.
        asset: Asset,
    },
}

/// Parses `text` as a positive amount of `asset` in minor units: at most `asset`'s scale
/// of decimal places, greater than 0, at most [`Asset::max_units`].
///
/// Errors: [`AmountError`] naming the broken rule (`what` names the field).
// ANCHOR: parse_amount (quoted by docs/articles/frozen-balances.md; `./run.sh cite --check`)
pub fn parse_amount(what: &'static str, asset: Asset, text: &str) -> Result<i64, AmountError> {
    let units = parse_units(what, asset, text)?;
    if units > i128::from(asset.max_units()) {
        return Err(AmountError::OverMaximum {
            what,
            maximum: format!("{} {asset}", format_units(asset, asset.max_units())),
        });
    }
    // At most max_units, which fits i64.
    Ok(units as i64)
}
// ANCHOR_END: parse_amount

/// Parses an order or fill quantity of `market`'s base asset: an amount that is a
/// multiple of the lot.
///
/// Errors: [`AmountError`].
pub fn parse_quantity(market: Market, text: &str) -> Result<i64, AmountError> {
    let units = parse_amount("quantity", market.base(), text)?;
    if units % market.lot_units() != 0 {
        return Err(AmountError::OffStep {
            what: "quantity",
            step: format!(
                "{} {} (the lot)",
                format_trimmed(market.base(), market.lot_units()),
                market.base()
            ),
        });
    }
    Ok(units)
}

/// Parses a price of `market` in quote units per whole base coin: positive, a multiple of
/// the tick, at most [`Market::max_price_units`].
///
/// Errors: [`AmountError`].
pub fn parse_price(market: Market, text: &str) -> Result<i64, AmountError> {
    let units = parse_units("price", market.quote(), text)?;
    if units > i128::from(market.max_price_units()) {
        return Err(AmountError::OverMaximum {
            what: "price",
            maximum: format!(
                "{} {} per {}",
                format_trimmed(market.quote(), market.max_price_units()),
                market.quote(),
                market.base()
            ),
        });
    }
    let units = units as i64;
    if units % market.tick_units() != 0 {
        return Err(AmountError::OffStep {
            what: "price",
            step: format!(
                "{} {} (the tick)",
                format_trimmed(market.quote(), market.tick_units()),
                market.quote()
            ),
        });
    }
    Ok(units)
}

/// The grammar and scale, without the maximum: `(0|[1-9][0-9]*)(\.[0-9]+)?`, at most
/// `asset.scale()` places, value > 0. Returns minor units (128 bits, so no text of at
/// most [`MAX_DECIMAL_CHARS`] characters can overflow).
fn parse_units(what: &'static str, asset: Asset, text: &str) -> Result<i128, AmountError> {
    if text.len() > MAX_DECIMAL_CHARS {
        return Err(AmountError::TooLong { what });
    }
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits_only(whole) || (whole.len() > 1 && whole.starts_with('0')) {
        return Err(AmountError::Syntax { what });
    }
    let fraction = fraction.unwrap_or("");
    if text.contains('.') && !digits_only(fraction) {
        return Err(AmountError::Syntax { what });
    }
    // ANCHOR: too_precise (quoted by docs/articles/frozen-balances.md; `./run.sh cite --check`)
    let scale = asset.scale();
    if fraction.len() > scale as usize {
        return Err(AmountError::TooPrecise {
            what,
            asset,
            places: fraction.len(),
            scale,
        });
    }
    // ANCHOR_END: too_precise
    let too_long = || AmountError::TooLong { what };
    let whole: i128 = whole.parse().map_err(|_| too_long())?;
    let mut fraction_units: i128 = 0;
    for (place, digit) in fraction.bytes().enumerate() {
        let weight = 10_i128.pow(scale - 1 - place as u32);
        fraction_units += i128::from(digit - b'0') * weight;
    }
    let units = whole
        .checked_mul(i128::from(asset.units_per_coin()))
        .and_then(|w| w.checked_add(fraction_units))
        .ok_or_else(too_long)?;
    if units == 0 {
        return Err(AmountError::NotPositive { what });
    }
    Ok(units)
}

/// `units` of `asset` as decimal text with exactly the asset's scale of places:
/// `format_units(Asset::Usdt, 5_095_100_000) == "5095.100000"`, negative values with `-`.
pub fn format_units(asset: Asset, units: i64) -> String {
    let per_coin = asset.units_per_coin().unsigned_abs();
    let magnitude = units.unsigned_abs();
    let sign = if units < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:0width$}",
        magnitude / per_coin,
        magnitude % per_coin,
        width = asset.scale() as usize
    )
}

/// Like [`format_units`] without trailing zeros in the fraction (and without the point
/// when nothing is left): `0.0001`, `10000000`. For messages.
pub fn format_trimmed(asset: Asset, units: i64) -> String {
    let full = format_units(asset, units);
    full.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The quote amount of `quantity` base units at `price` quote units per whole base coin:
/// `quantity × price / 10^base_scale`, exact (lot × tick is a multiple of 10^base_scale),
/// checked against the 64-bit range.
///
/// Errors: [`AmountError::OutOfRange`] past `i64::MAX`; [`AmountError::OffStep`] if the
/// product is not a whole number of quote units (quantity or price off its step).
pub fn notional_units(market: Market, quantity: i64, price: i64) -> Result<i64, AmountError> {
    let product = i128::from(quantity) * i128::from(price);
    let per_coin = i128::from(market.base().units_per_coin());
    if product % per_coin != 0 {
        return Err(AmountError::OffStep {
            what: "quantity × price",
            step: format!("1 {} unit", market.quote()),
        });
    }
    i64::try_from(product / per_coin).map_err(|_| AmountError::OutOfRange {
        what: "quantity × price",
        asset: market.quote(),
    })
}

/// A fill's fee on `notional` quote units: [`FEE_BPS`] of it, rounded **down** (in the
/// trader's favour).
pub fn fee_units(notional: i64) -> i64 {
    (i128::from(notional) * i128::from(FEE_BPS) / i128::from(BPS_PER_WHOLE)) as i64
}

/// A BUY's fee reserve on `notional` quote units at placement: [`FEE_BPS`] of it, rounded
/// **up**, so that every fill's share of the reserve covers that fill's fee.
pub fn fee_reserve_units(notional: i64) -> i64 {
    let numerator = i128::from(notional) * i128::from(FEE_BPS);
    let whole = i128::from(BPS_PER_WHOLE);
    ((numerator + whole - 1) / whole) as i64
}

/// The share of `fee_reserve` a fill of `quantity` out of `order_quantity` releases:
/// `floor(fee_reserve × quantity / order_quantity)`, in 128 bits.
pub fn reserve_share_units(fee_reserve: i64, quantity: i64, order_quantity: i64) -> i64 {
    (i128::from(fee_reserve) * i128::from(quantity) / i128::from(order_quantity)) as i64
}

/// What a placement freezes, quote or base units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freeze {
    /// The asset frozen.
    pub asset: Asset,
    /// The whole freeze, fee reserve included.
    pub amount: i64,
    /// The fee reserve inside `amount` (0 for a SELL).
    pub fee_reserve: i64,
}

/// The freeze of an order: BUY → `quantity × limit` + [`fee_reserve_units`] of quote;
/// SELL → `quantity` of base. Checked in 128 bits against the 64-bit range and the frozen
/// asset's maximum.
///
/// Errors: [`AmountError::OutOfRange`] or [`AmountError::OverMaximum`].
pub fn order_freeze(
    market: Market,
    side: crate::asset::Side,
    quantity: i64,
    limit: i64,
) -> Result<Freeze, AmountError> {
    match side {
        crate::asset::Side::Sell => Ok(Freeze {
            asset: market.base(),
            amount: quantity,
            fee_reserve: 0,
        }),
        crate::asset::Side::Buy => {
            let asset = market.quote();
            let notional = notional_units(market, quantity, limit)?;
            let fee_reserve = fee_reserve_units(notional);
            let amount = notional
                .checked_add(fee_reserve)
                .ok_or(AmountError::OutOfRange {
                    what: "order freeze",
                    asset,
                })?;
            if amount > asset.max_units() {
                return Err(AmountError::OverMaximum {
                    what: "order freeze (quantity × price + fee reserve)",
                    maximum: format!("{} {asset}", format_trimmed(asset, asset.max_units())),
                });
            }
            Ok(Freeze {
                asset,
                amount,
                fee_reserve,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asset::Side;

    const M: Market = Market::BtcUsdt;

    #[test]
    fn valid_amounts() {
        assert_eq!(
            parse_amount("amount", Asset::Usdt, "10000"),
            Ok(10_000_000_000)
        );
        assert_eq!(parse_amount("amount", Asset::Usdt, "0.000001"), Ok(1));
        assert_eq!(parse_amount("amount", Asset::Btc, "2"), Ok(200_000_000));
        assert_eq!(parse_amount("amount", Asset::Btc, "0.00000001"), Ok(1));
        assert_eq!(
            parse_amount("amount", Asset::Btc, "21000000"),
            Ok(Asset::Btc.max_units())
        );
        assert_eq!(
            parse_amount("amount", Asset::Usdt, "1000000000000.000000"),
            Ok(Asset::Usdt.max_units())
        );
    }

    #[test]
    fn refused_amounts() {
        let btc = |t: &str| parse_amount("amount", Asset::Btc, t);
        assert!(matches!(
            btc("0.000100001"),
            Err(AmountError::TooPrecise { places: 9, .. })
        ));
        // Trailing zeros beyond the scale are places too: refused, never rounded.
        assert!(matches!(
            btc("1.000000000"),
            Err(AmountError::TooPrecise { .. })
        ));
        for bad in [
            "1e-8", "+1", "1.", ".5", "-1", "", " 1", "1 ", "01", "00.5", "1,5", "0x10", "1..2",
            "١", "NaN", "inf",
        ] {
            assert!(
                matches!(btc(bad), Err(AmountError::Syntax { .. })),
                "{bad:?}: {:?}",
                btc(bad)
            );
        }
        for zero in ["0", "0.0", "0.00000000"] {
            assert!(matches!(btc(zero), Err(AmountError::NotPositive { .. })));
        }
        assert!(matches!(
            btc("21000000.00000001"),
            Err(AmountError::OverMaximum { .. })
        ));
        assert!(matches!(
            parse_amount("amount", Asset::Usdt, "1000000000000.000001"),
            Err(AmountError::OverMaximum { .. })
        ));
        assert!(matches!(
            btc(&"9".repeat(31)),
            Err(AmountError::TooLong { .. })
        ));
        // 30 digits parse in 128 bits and are then over the maximum, not a wrap.
        assert!(matches!(
            btc(&"9".repeat(30)),
            Err(AmountError::OverMaximum { .. })
        ));
    }

    #[test]
    fn quantities_and_prices() {
        assert_eq!(parse_quantity(M, "1.0000"), Ok(100_000_000));
        assert_eq!(parse_quantity(M, "0.0001"), Ok(10_000));
        assert!(matches!(
            parse_quantity(M, "0.00015"),
            Err(AmountError::OffStep { .. })
        ));
        assert!(matches!(
            parse_quantity(M, "0.000100001"),
            Err(AmountError::TooPrecise { .. })
        ));
        assert_eq!(parse_price(M, "5000.00"), Ok(5_000_000_000));
        assert_eq!(parse_price(M, "5000.05"), Ok(5_000_050_000));
        assert!(matches!(
            parse_price(M, "5000.001"),
            Err(AmountError::OffStep { .. })
        ));
        assert!(matches!(
            parse_price(M, "10000000.01"),
            Err(AmountError::OverMaximum { .. })
        ));
        assert_eq!(parse_price(M, "10000000.00"), Ok(M.max_price_units()));
        assert!(matches!(
            parse_price(M, "0.00"),
            Err(AmountError::NotPositive { .. })
        ));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_units(Asset::Usdt, 5_095_100_000), "5095.100000");
        assert_eq!(format_units(Asset::Btc, 100_000_000), "1.00000000");
        assert_eq!(format_units(Asset::Usdt, -10_000_000_000), "-10000.000000");
        assert_eq!(format_units(Asset::Usdt, 0), "0.000000");
        assert_eq!(format_units(Asset::Usdt, 1), "0.000001");
        assert_eq!(format_units(Asset::Btc, i64::MIN), "-92233720368.54775808");
        assert_eq!(format_trimmed(Asset::Btc, 10_000), "0.0001");
        assert_eq!(format_trimmed(Asset::Usdt, 10_000_000_000_000), "10000000");
    }

    /// SPEC §8 F1 and F11 figures.
    #[test]
    fn spec_figures() {
        let qty = parse_quantity(M, "1.0000").unwrap();
        let limit = parse_price(M, "5000.00").unwrap();
        let freeze = order_freeze(M, Side::Buy, qty, limit).unwrap();
        assert_eq!(format_units(Asset::Usdt, freeze.amount), "5005.000000");
        assert_eq!(format_units(Asset::Usdt, freeze.fee_reserve), "5.000000");
        let fill = parse_quantity(M, "0.4000").unwrap();
        let notional = notional_units(M, fill, parse_price(M, "4900").unwrap()).unwrap();
        assert_eq!(format_units(Asset::Usdt, notional), "1960.000000");
        assert_eq!(format_units(Asset::Usdt, fee_units(notional)), "1.960000");
        assert_eq!(
            reserve_share_units(freeze.fee_reserve, fill, qty),
            2_000_000
        );

        let qty = parse_quantity(M, "0.0002").unwrap();
        let limit = parse_price(M, "5000.05").unwrap();
        let freeze = order_freeze(M, Side::Buy, qty, limit).unwrap();
        assert_eq!(freeze.amount - freeze.fee_reserve, 1_000_010);
        assert_eq!(freeze.fee_reserve, 1_001);
        let half = parse_quantity(M, "0.0001").unwrap();
        let notional = notional_units(M, half, limit).unwrap();
        assert_eq!(notional, 500_005);
        assert_eq!(fee_units(notional), 500);
        assert_eq!(reserve_share_units(freeze.fee_reserve, half, qty), 500);
    }

    #[test]
    fn notional_past_the_bigint_range_is_refused() {
        let qty = parse_quantity(M, "21000000").unwrap();
        let price = parse_price(M, "10000000.00").unwrap();
        assert!(matches!(
            order_freeze(M, Side::Buy, qty, price),
            Err(AmountError::OutOfRange { .. })
        ));
        // Within the bigint range but past USDT's maximum of 10^12 coins.
        let qty = parse_quantity(M, "200000").unwrap();
        assert!(matches!(
            order_freeze(M, Side::Buy, qty, price),
            Err(AmountError::OverMaximum { .. })
        ));
    }

    /// The rounding rule of SPEC §8: for any split of an order into fills and any price at
    /// or below the limit, each non-final fill's reserve share covers its fee.
    #[test]
    fn reserve_share_covers_fee_exhaustively_on_small_orders() {
        for order_lots in 1..=12_i64 {
            for limit_ticks in [1_i64, 7, 99, 100, 101, 499_999, 500_005, 999_999] {
                let order_qty = order_lots * M.lot_units();
                let limit = limit_ticks * M.tick_units();
                let freeze = order_freeze(M, Side::Buy, order_qty, limit).unwrap();
                for fill_lots in 1..=order_lots {
                    let qty = fill_lots * M.lot_units();
                    let share = reserve_share_units(freeze.fee_reserve, qty, order_qty);
                    for price_ticks in [1, limit_ticks / 2 + 1, limit_ticks] {
                        let price = price_ticks * M.tick_units();
                        let fee = fee_units(notional_units(M, qty, price).unwrap());
                        assert!(share >= fee, "{order_lots} {limit_ticks} {fill_lots}");
                    }
                }
            }
        }
    }
}
