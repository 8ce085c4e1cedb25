/* dp: (to be written) */
